# Python dependencies that nixpkgs does not carry at the versions skilld needs (wasmtime 50,
# mcp 2.x, componentize-py, ...), installed from wheels pinned by name, version, tags and
# sha256. fetchPypi (format = "wheel") derives where PyPI serves each one, so the repository
# carries no download URL. wheels.json lists them per system; it is written by nix/wheels.py
# (`just nix-wheels`) from pyproject.toml, so run that after changing dependencies and commit
# the result.
{ pkgs }:
let
  lock = builtins.fromJSON (builtins.readFile ./wheels.json);
  fromWheel = py: w: let
    filename = "${w.pname}-${w.version}-${w.python}-${w.abi}-${w.platform}.whl";
    native = w.platform != "any";
  in py.pkgs.buildPythonPackage {
    pname = w.name;
    inherit (w) version;
    format = "other";
    src = pkgs.fetchPypi {
      inherit (w) pname version dist python abi platform sha256;
      format = "wheel";
    };
    dontUnpack = true;
    # manylinux wheels carry native code linked against libgcc_s/libstdc++, which are not on
    # a Nix system's default search path.
    nativeBuildInputs = pkgs.lib.optional native pkgs.autoPatchelfHook;
    buildInputs = pkgs.lib.optional native pkgs.stdenv.cc.cc.lib;
    # pip reads name and version from the file name, and the store path's is prefixed by a hash.
    installPhase = ''
      cp $src $TMPDIR/${filename}
      ${py.pkgs.pip}/bin/pip install --no-index --no-deps --no-cache-dir \
        --disable-pip-version-check \
        --prefix $out $TMPDIR/${filename}
    '';
  };
  wheelsFor = set: py: map (fromWheel py) lock.systems.${pkgs.stdenv.hostPlatform.system}.${set};
in {
  # skilld's runtime dependency closure.
  runtime = wheelsFor "runtime";
  # What `skilld build` needs on top (componentize-py).
  build = wheelsFor "build";
}
