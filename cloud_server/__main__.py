from cloud_server.cli import main

raise SystemExit(main())
