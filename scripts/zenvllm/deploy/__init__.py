"""What the Ansible roles are made from: each role's variables (their defaults, types and
docs), the playbook runner, the planner zipapp the hosts receive, where the package's
data lives and the rule for writing outputs zenvllm owns.

Between runtime and image: images and benchmarks read it, it reads neither.
"""
