"""Put this whole machine on the path an AVX2-only CPU (AMD EPYC Zen 3) takes, so that
the full test suite runs there: `make test` under an AVX2 view, on any x86 host.

    python3 tests/support/avx2_machine.py on      # then, in the same shell:
    ZENVLLM_TEST_AVX2_VIEW=/run/zenvllm-avx2 CI=true bash .ci/run
    python3 tests/support/avx2_machine.py off

tests/support/avx2_path.py forces one container onto that path; this forces every
process the suite starts, wherever it runs:
* this machine's processes (pytest, the planner, Ansible's controller) read a Zen 3
  /proc/cpuinfo: a view of this machine's CPU count is bind-mounted over it;
* every container, from this machine's engines and from the test hosts' Docker, is
  started through a runc wrapper that adds to its OCI config what avx2_path.py passes
  with `docker run`: the same /proc/cpuinfo view, ONEDNN_MAX_CPU_ISA=AVX2 and
  ATEN_CPU_CAPABILITY=avx2, and a sitecustomize (on PYTHONPATH) that makes torch.cpu's
  capability checks answer False when torch.cpu is first imported, so that vLLM loads
  its AVX2 kernels and torch's compiler writes AVX2 code. A container that binds its
  own /proc/cpuinfo view (the image tier's) or sets those variables keeps its own;
* the test hosts (tests/support/nspawn.py, when ZENVLLM_TEST_AVX2_VIEW names this
  directory) get the view over their /proc/cpuinfo and the wrapper at
  /usr/local/sbin/runc, first on their containerd's PATH, so the runc their Docker
  installs stays Debian's own.
The kernel still offers this machine's other features to code that asks the CPU
itself (cpuid, AMX's tile permission: the real /proc/cpuinfo is kept beside the view
for the tests that ask), and its cores keep their speed: the result is the path's work, not a
Zen 3's timing. `off` removes the mounts and the directory; nothing else is changed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # Debian's python3
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import cpu

VIEW = Path("/run/zenvllm-avx2")
RUNC = Path("/usr/sbin/runc")  # Debian's; /usr/bin/runc links to it
IN_CONTAINER = "/zenvllm-avx2"  # where the sitecustomize is bound in a container
MARK_FILE, MARK = ".zenvllm-avx2-view", "made by zenvllm's tests/support/avx2_machine.py\n"

# torch.cpu's capability checks that vLLM (kernel library, AMX GEMM and attention) and
# torch's compiler (its vector ISA) read.
SITECUSTOMIZE = '''\
"""The AVX2 view (zenvllm's tests/support/avx2_machine.py): torch.cpu says no AVX-512."""
import importlib.machinery
import sys

CHECKS = ("avx512", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_fp16")


class _AVX2View:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "torch.cpu":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for check in CHECKS:
                setattr(module, f"_is_{check}_supported", lambda: False)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AVX2View)
'''

WRAPPER_TEMPLATE = r"""#!/usr/bin/python3
# runc, with the AVX2 view added to a container's OCI config (tests/support/avx2_machine.py).
import json
import os
import sys

VIEW = "@VIEW@"
IN_CONTAINER = "@IN_CONTAINER@"
ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
RO = ["rbind", "ro", "rprivate"]


def bundle(args):
    for i, arg in enumerate(args):
        if arg in ("--bundle", "-b") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--bundle="):
            return arg.split("=", 1)[1]
    return "."


def add_view(config):
    mounts = config.setdefault("mounts", [])
    if not any(m.get("destination") == "/proc/cpuinfo" for m in mounts):
        mounts.append({"destination": "/proc/cpuinfo", "type": "bind",
                       "source": VIEW + "/cpuinfo", "options": RO})
    mounts.append({"destination": IN_CONTAINER, "type": "bind",
                   "source": VIEW + "/python", "options": RO})
    env = config.setdefault("process", {}).setdefault("env", [])
    names = {e.split("=", 1)[0]: i for i, e in enumerate(env)}
    env.extend(f"{k}={v}" for k, v in ENV.items() if k not in names)
    if "PYTHONPATH" in names:
        i = names["PYTHONPATH"]
        env[i] = f"PYTHONPATH={IN_CONTAINER}:" + env[i].split("=", 1)[1]
    else:
        env.append(f"PYTHONPATH={IN_CONTAINER}")


def record(config):
    # Which host started what under the view (best effort).
    try:
        with open(VIEW + "/log/containers.log", "a") as f:
            argv = " ".join(config["process"].get("args", [])).replace("\n", " ")[:300]
            f.write(f"{os.uname().nodename}\t{argv}\n")
    except OSError:
        pass


args = sys.argv[1:]
if any(a in ("create", "run") for a in args):
    path = os.path.join(bundle(args), "config.json")
    with open(path) as f:
        config = json.load(f)
    add_view(config)
    with open(path + ".avx2", "w") as f:
        json.dump(config, f)
    os.replace(path + ".avx2", path)
    record(config)
os.execv(VIEW + "/runc.real", [VIEW + "/runc.real", *args])
"""


def wrapper(view: Path) -> str:
    """The runc wrapper for a view directory (runc.real, cpuinfo, python/, log/ in it)."""
    return WRAPPER_TEMPLATE.replace("@VIEW@", str(view)).replace("@IN_CONTAINER@", IN_CONTAINER)


def mounts_on(path: Path) -> list[str]:
    """What is mounted on path, by the source each mount shows (a file mount too, which
    `mountpoint` misses): mountinfo's root field, then its mount point."""
    with open("/proc/self/mountinfo") as f:
        return [line.split()[3] for line in f if line.split()[4] == str(path)]


def ours() -> bool:
    """Whether VIEW is this tool's: the mark `on` writes first (by content, not name)."""
    mark = VIEW / MARK_FILE
    return mark.is_file() and mark.read_text() == MARK


def on() -> None:
    if mounts_on(RUNC) or mounts_on(Path("/proc/cpuinfo")):
        sys.exit(f"{RUNC} or /proc/cpuinfo has a mount already; run `off` first")
    if VIEW.exists() and not ours():
        sys.exit(f"{VIEW} exists and this tool did not make it; move it away")
    VIEW.mkdir(parents=True, exist_ok=True)
    (VIEW / MARK_FILE).write_text(MARK)
    # The CPU's own, for what the view cannot hide: the kernel offers AMX whatever
    # /proc/cpuinfo says (tests/support/cpu.py: has_amx).
    shutil.copyfile("/proc/cpuinfo", VIEW / cpu.REAL_CPUINFO)
    (VIEW / "cpuinfo").write_text(cpu.fake_cpuinfo("amd-zen3-avx2", len(cpu.this_host().cpus)))
    (VIEW / "python").mkdir(exist_ok=True)
    (VIEW / "log").mkdir(exist_ok=True)
    (VIEW / "python/sitecustomize.py").write_text(SITECUSTOMIZE)
    shutil.copy2(RUNC, VIEW / "runc.real")
    (VIEW / "runc").write_text(wrapper(VIEW))
    (VIEW / "runc").chmod(0o755)
    subprocess.run(["mount", "--bind", "-o", "ro", str(VIEW / "runc"), str(RUNC)], check=True)
    subprocess.run(["mount", "--bind", str(VIEW / "cpuinfo"), "/proc/cpuinfo"], check=True)
    print(f"AVX2 view on: set ZENVLLM_TEST_AVX2_VIEW={VIEW} for the test hosts")


def off() -> None:
    """Only this tool's mounts and directory go; anything else mounted there stays."""
    for path, source in ((Path("/proc/cpuinfo"), VIEW / "cpuinfo"), (RUNC, VIEW / "runc")):
        while mounts_on(path) and mounts_on(path)[-1] == str(source):
            subprocess.run(["umount", str(path)], check=True)
    if ours():
        shutil.rmtree(VIEW)


if __name__ == "__main__":
    verbs = {"on": on, "off": off}
    if len(sys.argv) != 2 or sys.argv[1] not in verbs or os.geteuid() != 0:
        sys.exit(f"usage (as root): {sys.argv[0]} on|off")
    verbs[sys.argv[1]]()
