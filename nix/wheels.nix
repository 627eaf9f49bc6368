# Python dependencies that nixpkgs does not carry at the versions skilld needs, taken from
# the wheelhouse directory (`just wheelhouse`) and installed offline. Regenerate the hashes
# with `just nix-wheels` after changing dependencies.
{ pkgs }:
let
  wheelhouse = ../wheelhouse;
  fromWheel = py: name: py.pkgs.buildPythonPackage {
    pname = name;
    version = "wheelhouse";
    format = "other";
    src = wheelhouse;
    dontUnpack = true;
    installPhase = ''
      ${py.pkgs.pip}/bin/pip install --no-index --no-deps --find-links $src \
        --prefix $out ${name}
    '';
  };
in {
  runtime = py: map (fromWheel py) [
    "wasmtime" "mcp" "mcp-types" "pyyaml" "cryptography" "nats-py" "structlog"
    "anyio" "starlette" "uvicorn" "sse-starlette" "pydantic" "pydantic-core" "httpx2"
  ];
  build = py: map (fromWheel py) [ "componentize-py" ];
}
