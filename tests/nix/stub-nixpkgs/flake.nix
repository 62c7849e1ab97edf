{
  # A stand-in for nixpkgs, for `nix flake check --override-input nixpkgs` where the real one
  # cannot be fetched (CI has no GitHub). It has exactly the attributes mxc's flake.nix uses,
  # each a trivial derivation, and asserts the arguments have the shapes nixpkgs expects: the
  # check proves the flake evaluates and its outputs have the right schema, not that it builds.
  description = "stub nixpkgs for checking mxc's flake offline";

  outputs = { self }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      lib = {
        genAttrs = names: f: builtins.listToAttrs (map (name: { inherit name; value = f name; }) names);
        optional = cond: x: if cond then [ x ] else [ ];
        cleanSource = src: assert builtins.isPath src; src;
      };
      forSystem = system:
        let
          drv = name: derivation { inherit name system; builder = "/bin/sh"; args = [ "-c" "echo ${name} > $out" ]; };
          isDrv = x: (x.type or null) == "derivation";
          allDrvs = xs: builtins.isList xs && builtins.all isDrv xs;
          pythonPackages = lib.genAttrs [
            "setuptools" "wheel" "pydantic" "jinja2" "pyyaml" "gitpython" "requests" "spython"
            "pytest" "pytest-timeout" "mypy" "types-pyyaml" "types-requests" "prometheus-client"
          ] (name: drv "python3.12-${name}") // {
            buildPythonApplication = args:
              assert builtins.isString args.pname && builtins.isString args.version;
              assert args.pyproject == true && allDrvs args.build-system && allDrvs args.dependencies;
              assert args.meta.mainProgram == "mxc";
              drv "${args.pname}-${args.version}";
          };
        in
        lib.genAttrs [ "ruff" "shellcheck" "prometheus" "slurm" "munge" "podman" "skopeo" "git" "apptainer" ] drv // {
          python312Packages = pythonPackages;
          python312 = drv "python3-3.12" // {
            withPackages = f: assert allDrvs (f pythonPackages); drv "python3-3.12-env";
          };
          stdenv = { isLinux = true; };
          mkShell = args: assert allDrvs args.packages && builtins.isString args.shellHook; drv "nix-shell";
        };
    in
    {
      inherit lib;
      legacyPackages = lib.genAttrs systems forSystem;
    };
}
