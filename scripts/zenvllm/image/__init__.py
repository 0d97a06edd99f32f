"""Images: the compatibility matrix, build contexts, builds and the base image.

Also the two edges every later layer shares: the engine runner (docker or
podman) and the rule for writing outputs zenvllm owns. Needs Jinja2, PyYAML and
packaging; stays on the machine that builds.
"""
