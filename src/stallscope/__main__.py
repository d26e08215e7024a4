from stallscope.cli.main import main

raise SystemExit(main())
