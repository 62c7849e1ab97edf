{
  # The host-tools layer of mxc's environments (docs/environments.md): the Python that runs
  # mxc and the tools around a run (shellcheck, Prometheus, the Slurm client, Podman, and
  # Apptainer where the platform has it), all pinned by flake.lock. The training stack itself
  # (jax, maxtext) is not here: it comes from an image of images/ or from the hashed
  # lockfiles/requirements-*.txt, the same pins on a laptop and on the cluster.
  #
  #   nix develop            # the dev shell
  #   nix build .#mxc        # mxc as a package (result/bin/mxc)
  description = "mxc: compile MaxText training job specs into reproducible, hash-addressed bundles";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-24.11";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      lib = nixpkgs.lib;
      forAllSystems = f: lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
      project = (builtins.fromTOML (builtins.readFile ./pyproject.toml)).project;

      # mxc's runtime dependencies (pyproject [project] dependencies + the images extra).
      runtimeDeps = ps: [ ps.pydantic ps.jinja2 ps.pyyaml ps.gitpython ps.requests ]
        ++ lib.optional (ps ? spython) ps.spython;
      # What the test suite and the linters need on top (pyproject's dev and observe extras).
      devDeps = ps: [ ps.pytest ps.pytest-timeout ps.mypy ps.types-pyyaml ps.types-requests ps.prometheus-client ];
    in
    {
      packages = forAllSystems (pkgs: rec {
        mxc = pkgs.python312Packages.buildPythonApplication {
          pname = project.name;
          version = project.version;
          pyproject = true;
          src = lib.cleanSource ./.;
          build-system = [ pkgs.python312Packages.setuptools pkgs.python312Packages.wheel ];
          dependencies = runtimeDeps pkgs.python312Packages;
          # The tests start Slurm, Prometheus, Podman and train MaxText: run them in the dev shell.
          doCheck = false;
          meta = {
            description = project.description;
            mainProgram = "mxc";
          };
        };
        default = mxc;
      });

      devShells = forAllSystems (pkgs: {
        default = pkgs.mkShell {
          packages = [
            (pkgs.python312.withPackages (ps: runtimeDeps ps ++ devDeps ps))
            pkgs.ruff
            pkgs.shellcheck
            pkgs.prometheus
            pkgs.slurm
            pkgs.munge
            pkgs.podman
            pkgs.skopeo
            pkgs.git
          ] ++ lib.optional (pkgs.stdenv.isLinux && pkgs ? apptainer) pkgs.apptainer;
          shellHook = ''
            # The training stack is pinned by hash, not by Nix: create the venv from the lock once.
            #   python -m venv .venv && .venv/bin/pip install --require-hashes -r lockfiles/requirements-train.txt
            #   .venv/bin/pip install --no-deps -e .
            export MXC_IMAGE_PYTHON=''${MXC_IMAGE_PYTHON:-$(command -v python3.12)}
          '';
        };
      });
    };
}
