"""One module per ``gpulse`` subcommand; each defines ``add_arguments(parser)`` and ``run(args)``."""
