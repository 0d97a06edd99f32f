"""What runs on a host and inside an image, over the core.

The image's launcher and health check, `doctor`, the AMX request, and the host's
command line (`python3 -m zenvllm.runtime plan|doctor`, which Ansible runs).
Standard library only. Hosts and images receive it with the core.
"""
