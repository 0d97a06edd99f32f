"""Images: the compatibility matrix, build contexts, builds and the base image.

Also the edges every later layer shares: the engine runner (docker or podman),
the playbook runner (ansible-playbook) and the rule for writing outputs zenvllm
owns. Needs Jinja2, PyYAML and packaging; stays on the machine that builds.
"""
