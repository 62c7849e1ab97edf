from mxc.cli.main import main

raise SystemExit(main())
