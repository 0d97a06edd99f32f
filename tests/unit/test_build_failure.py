"""`zenvllm build` names the step that failed, from BuildKit's or the legacy builder's output."""

from __future__ import annotations

from zenvllm.image.build import failed_step, failure_message

BUILDKIT = """\
#10 [os 6/6] RUN useradd --system --uid 10001 vllm
#10 CACHED

#11 [build 1/5] RUN python3 -m venv /opt/uv     && /opt/uv/bin/pip install uv==0.13.99
#11 sha256:47f5783f18028bc5d051546a7aed78a93e5966ebe30bffa602e1dd71a5f7291e
#11 12.78 ERROR: Could not find a version that satisfies the requirement uv==0.13.99
#11 12.78 ERROR: No matching distribution found for uv==0.13.99
#11 ERROR: executor failed running [/bin/bash -o pipefail -c python3 -m venv /opt/uv]: exit code: 1
------
 > [build 1/5] RUN python3 -m venv /opt/uv     && /opt/uv/bin/pip install uv==0.13.99:
------
""".splitlines(keepends=True)

LEGACY = """\
Step 6/20 : RUN useradd --system --uid 10001 vllm
 ---> Using cache
Step 7/20 : RUN python3 -m venv /opt/uv && /opt/uv/bin/pip install uv==0.13.99
 ---> Running in 0123456789ab
ERROR: No matching distribution found for uv==0.13.99
The command '/bin/bash -o pipefail -c python3 -m venv /opt/uv' returned a non-zero code: 1
""".splitlines(keepends=True)


def test_buildkit_failure_names_the_step_and_the_error():
    step, said = failed_step(BUILDKIT)
    assert step.startswith("[build 1/5] RUN python3 -m venv /opt/uv")
    assert said[-1].strip() == "ERROR: No matching distribution found for uv==0.13.99"
    message = failure_message(1, BUILDKIT, None)
    assert "failed at step [build 1/5] RUN python3 -m venv /opt/uv && " in message
    assert "No matching distribution found for uv==0.13.99" in message
    assert "--pin NAME=VERSION" in message and "No image was tagged" in message


def test_a_step_with_mounts_is_named_by_its_command():
    """An install in place mounts five things before its command: the message keeps the
    command (its first 300 characters would otherwise be mounts)."""
    mounts = " ".join(f"--mount=type=bind,source=s{i},target=/tmp/t{i}" for i in range(8))
    lines = [line.replace("[build 1/5] RUN ", f"[runtime 2/5] RUN {mounts} ") for line in BUILDKIT]
    message = failure_message(1, lines, None)
    assert "failed at step [runtime 2/5] RUN python3 -m venv /opt/uv && " in message
    assert "--mount=" not in message


def test_legacy_failure_names_the_step():
    step, said = failed_step(LEGACY)
    assert step == "Step 7/20 : RUN python3 -m venv /opt/uv && /opt/uv/bin/pip install uv==0.13.99"
    assert said == ["ERROR: No matching distribution found for uv==0.13.99\n"]


def test_unknown_output_falls_back_to_the_tail():
    message = failure_message(3, ["something odd\n"], None)
    assert message.startswith("the image build failed (exit 3)") and "something odd" in message
