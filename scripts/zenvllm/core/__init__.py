"""The core: pure decisions over facts, standard library only.

The host and model as read (host, topology, model, flavors), what each target
needs (targets, accelerators), the plan (plan), one instance's container
(container) and the promise a deployment makes its instances (deployed).
Nothing here writes a file or starts a process. Hosts and images receive it.
"""
