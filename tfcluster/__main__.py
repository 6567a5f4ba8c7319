from tfcluster.cli import main

raise SystemExit(main())
