"""Images: the compatibility matrix, build contexts, builds and the base image.

Also the engine runner (docker or podman) every later layer shares. Needs Jinja2,
PyYAML and packaging; stays on the machine that builds.
"""
