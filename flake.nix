{
  description = "skilld: a sealed appliance that serves signed WebAssembly skills to AI agents as MCP tools";

  # The branch to follow; flake.lock pins the exact revision (and its narHash), so every
  # build uses the same nixpkgs. `nix flake update` moves the lock to the branch's head.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-24.11";

  outputs = { self, nixpkgs }:
    let
      # The systems nix/wheels.json has wheels for (`just nix-wheels` writes x86_64-linux and
      # aarch64-linux): without its wheels a system could not build skilld.
      systems = builtins.attrNames (builtins.fromJSON (builtins.readFile ./nix/wheels.json)).systems;
      forAll = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
    in {
      packages = forAll (pkgs:
        let
          py = pkgs.python311;
          # wasmtime, mcp 2.x and componentize-py are not in nixpkgs at these versions: every
          # Python dependency is a wheel pinned by name, version and sha256 in nix/wheels.json
          # (`just nix-wheels`), fetched with fetchPypi and installed with pip --no-index --no-deps.
          wheels = import ./nix/wheels.nix { inherit pkgs; };
          skilld = py.pkgs.buildPythonApplication {
            pname = "skilld";
            version = "0.1.0";
            pyproject = true;
            src = ./.;
            build-system = [ py.pkgs.setuptools ];
            dependencies = wheels.runtime py;
            pythonImportsCheck = [ "skilld" ];
            # The seccomp layer loads libseccomp.so.2 through ctypes (pyseccomp), which
            # looks on the library path: a Nix system has no /usr/lib.
            makeWrapperArgs = [ "--prefix" "LD_LIBRARY_PATH" ":" "${pkgs.libseccomp.lib}/lib" ];
          };
          builder = py.withPackages (_: [ skilld ] ++ wheels.build py);
          bundle = pkgs.runCommand "skilld-bundle" {
            nativeBuildInputs = [ builder ];
            SOURCE_DATE_EPOCH = "0";
          } ''
            export HOME=$TMPDIR SKILLD_CACHE=$TMPDIR/cache
            skilld build --skills ${./skills} --policies ${./policies} -o $out
          '';
        in {
          inherit skilld bundle;
          default = skilld;
          image = pkgs.dockerTools.buildLayeredImage {
            name = "skilld";
            tag = "latest";
            contents = [ skilld pkgs.cacert ];
            config = {
              User = "10001:10001";
              Entrypoint = [ "${skilld}/bin/skilld" "serve" "--bundle" "${bundle}"
                             "--transport" "http" "--host" "0.0.0.0" "--port" "8080" ];
              Env = [ "SKILLD_STATE_DIR=/var/lib/skilld" "SKILLD_CACHE=/var/lib/skilld/cache" ];
              Volumes = { "/var/lib/skilld" = { }; };
              ExposedPorts = { "8080/tcp" = { }; };
            };
          };
        });

      apps = forAll (pkgs: {
        default = {
          type = "app";
          program = toString (pkgs.writeShellScript "skilld-serve" ''
            exec ${self.packages.${pkgs.system}.skilld}/bin/skilld serve \
              --bundle ${self.packages.${pkgs.system}.bundle} "$@"
          '');
        };
      });

      devShells = forAll (pkgs: {
        default = pkgs.mkShell {
          packages = [ pkgs.python311 pkgs.just pkgs.buildah pkgs.nats-server ];
          shellHook = ''
            [ -d .venv ] || python3 -m venv .venv
            . .venv/bin/activate
            pip install -q -e '.[dev]'
          '';
        };
      });
    };
}
