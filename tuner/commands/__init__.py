"""One module per subcommand: `register(subparsers)` adds its parser, `args.run(args)` runs it."""
