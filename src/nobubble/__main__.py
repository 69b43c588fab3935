from nobubble.cli import main

raise SystemExit(main())
