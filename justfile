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
    rm -rf wheelhouse && SOURCE_DATE_EPOCH=315532800 {{venv}}/bin/pip wheel -q --wheel-dir wheelhouse '.[build]'

# Install from wheelhouse/ with no network into VENV (default: /tmp/skilld-airgap).
airgap-install VENV="/tmp/skilld-airgap":
    python3 -m venv {{VENV}} && {{VENV}}/bin/pip install -q --no-index --find-links wheelhouse 'skilld[build]'

# Build the container image with buildah (tools/oci-base makes its Debian base locally).
image TAG="localhost/skilld:dev": wheelhouse
    tools/oci-base
    buildah bud --isolation chroot --pull-never --layers --format docker -t {{TAG}} -f Containerfile .

# Serve the image on PORT (host network) as its unprivileged user, state in STATE.
image-run PORT="8080" STATE="/tmp/skilld-state" TAG="localhost/skilld:dev":
    mkdir -p {{STATE}} && chown 10001 {{STATE}}
    tools/oci-run {{TAG}} --volume {{STATE}}:/var/lib/skilld \
      -- /opt/skilld/bin/skilld serve --bundle /opt/skilld-bundle --transport http \
      --host 0.0.0.0 --port {{PORT}}

# Pin the flake's Python wheels (name, version, tags, sha256; no URLs) in nix/wheels.json from pyproject.toml.
nix-wheels:
    {{py}} nix/wheels.py

# Check that flake.nix and nix/*.nix parse (nix cannot build here: no binary cache).
nix-check:
    for f in flake.nix nix/*.nix; do nix-instantiate --parse "$f" >/dev/null || exit 1; done
