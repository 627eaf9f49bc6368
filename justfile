# Everyday recipes. `just --list` shows them.

venv := ".venv"
py := venv + "/bin/python"

# Create the virtual environment with every development tool.
setup:
    python3 -m venv {{venv}} && {{venv}}/bin/pip install -q -e '.[dev]'

# Run the whole test suite (what CI runs).
test *ARGS:
    {{py}} -m pytest {{ARGS}}

# Run the fast tests only.
test-fast *ARGS:
    {{py}} -m pytest -m "not slow" {{ARGS}}

# Lint and type-check.
lint:
    {{venv}}/bin/ruff check src tests bench skills nix
    {{venv}}/bin/mypy

# Build one skill from source: `just build-skill skills/notes`.
build-skill DIR OUT="":
    {{venv}}/bin/skilld skill build {{DIR}} -o {{ if OUT == "" { file_name(DIR) + ".wasm" } else { OUT } }}

# Build every sample skill into build/skills/.
build-skills:
    for d in skills/*/; do {{venv}}/bin/skilld skill build "$d" -o "build/skills/$(basename "$d").wasm"; done

# Run the benchmarks (ratios against a baseline, side by side).
bench:
    for b in bench/bench_*.py; do {{py}} "$b"; done

# Collect skilld and every dependency as wheels in wheelhouse/ (air-gapped installs; skilld's wheel reproducible).
wheelhouse:
    rm -rf wheelhouse && SOURCE_DATE_EPOCH=315532800 {{venv}}/bin/pip wheel -q --wheel-dir wheelhouse '.[build,otel]'

# Install from wheelhouse/ with no network into VENV (default: /tmp/skilld-airgap).
airgap-install VENV="/tmp/skilld-airgap":
    python3 -m venv {{VENV}} && {{VENV}}/bin/pip install -q --no-index --find-links wheelhouse 'skilld[build]'

# Build the container image with buildah (tools/oci-base makes its Debian base locally).
# With $SKILLD_CACHE set, the build stage reuses that digest-keyed cache of components and
# native code (mounted for the build only; nothing of it lands in a layer).
image TAG="localhost/skilld:dev": wheelhouse
    tools/oci-base
    buildah bud --isolation chroot --pull-never --layers --format docker \
      ${SKILLD_CACHE:+--volume "$SKILLD_CACHE:/tmp/skilld-cache"} -t {{TAG}} -f Containerfile .

# Copy the image into Docker's store (`docker run ... skilld:dev`).
image-docker TAG="localhost/skilld:dev" NAME="skilld:dev":
    buildah push {{TAG}} docker-daemon:{{NAME}}

# Serve the image on PORT (host network) as its unprivileged user, state in STATE.
image-run PORT="8080" STATE="/tmp/skilld-state" TAG="localhost/skilld:dev":
    mkdir -p {{STATE}} && chown 10001 {{STATE}}
    tools/oci-run {{TAG}} --volume {{STATE}}:/var/lib/skilld \
      -- /opt/skilld/bin/skilld serve --bundle /opt/skilld-bundle --transport http \
      --host 0.0.0.0 --port {{PORT}} --token-file /var/lib/skilld/tokens --token-file-init

# Pin the flake's Python wheels (name, version, tags, sha256; no URLs) in nix/wheels.json from pyproject.toml.
nix-wheels:
    {{py}} nix/wheels.py

# Check that flake.nix and nix/*.nix parse (nix cannot build here: no binary cache).
nix-check:
    for f in flake.nix nix/*.nix; do nix-instantiate --parse "$f" >/dev/null || exit 1; done

# A local cluster on the least-privilege bus `skilld cluster nats-config` writes (TLS, one
# NKey user per node, subject permissions, no anonymous user) on NATS_PORT, and three nodes
# of the whole demo bundle (kits included): node-a entry-only on http://127.0.0.1:PORT/mcp,
# node-b and node-c worker-only replicas sharing their skills' state in JetStream KV.
# Everything lives in DIR (keys and seeds too: keep it out of git); Ctrl-C stops it all.
# See docs/cluster.md.
cluster-demo DIR="/tmp/skilld-cluster-demo" PORT="8081" NATS_PORT="4333":
    #!/usr/bin/env bash
    set -euo pipefail
    mkdir -p {{DIR}}/policies/trust {{DIR}}/policies/kits {{DIR}}/keys
    # One key per node, trusted for that node's name only: no node can speak for another.
    if [ -f {{DIR}}/policies/trust/members.pub.json ]; then  # a shared key of older demos
      rm -rf {{DIR}}/policies/trust/members.pub.json {{DIR}}/member.pem {{DIR}}/bundle
    fi
    for n in node-a node-b node-c; do
      [ -f {{DIR}}/keys/$n.pem ] || {{venv}}/bin/skilld keygen -o {{DIR}}/keys/$n.pem \
        --trust-out {{DIR}}/policies/trust/$n.pub.json --cluster $n
    done
    if [ ! -f {{DIR}}/bus/nats.conf ]; then
      {{venv}}/bin/skilld cluster nats-config --out {{DIR}}/bus --port {{NATS_PORT}} \
        --node node-a --node node-b --node node-c
    fi
    cp policies/*.yaml {{DIR}}/policies/
    cp policies/kits/*.yaml {{DIR}}/policies/kits/
    cp policies/trust/*.pub.json {{DIR}}/policies/trust/ 2>/dev/null || true
    [ -f {{DIR}}/bundle/bundle.lock ] || \
      {{venv}}/bin/skilld build --skills skills --policies {{DIR}}/policies -o {{DIR}}/bundle
    trap 'kill 0' EXIT
    {{venv}}/bin/nats-server -c {{DIR}}/bus/nats.conf &
    sleep 1  # nats-server listens within milliseconds; the nodes retry within their timeout
    node() { {{venv}}/bin/skilld serve --bundle {{DIR}}/bundle --state-dir {{DIR}}/$1 \
      --cluster tls://127.0.0.1:{{NATS_PORT}} --nats-nkey {{DIR}}/bus/$1.nk \
      --nats-tls-ca {{DIR}}/bus/ca.pem --node $1 --cluster-key {{DIR}}/keys/$1.pem "${@:2}" & }
    node node-b --no-mcp --cluster-kv
    node node-c --no-mcp --cluster-kv
    node node-a --entry-only --transport http --port {{PORT}}
    echo "entry node: http://127.0.0.1:{{PORT}}/mcp   status: {{venv}}/bin/skilld cluster status --cluster tls://127.0.0.1:{{NATS_PORT}} --nats-nkey {{DIR}}/bus/observer.nk --nats-tls-ca {{DIR}}/bus/ca.pem --bundle {{DIR}}/bundle"
    wait
