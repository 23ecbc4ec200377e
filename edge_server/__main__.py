from edge_server.cli import main

raise SystemExit(main())
