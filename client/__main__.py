from client.cli import main

raise SystemExit(main())
