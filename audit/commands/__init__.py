"""One module per subcommand of `python -m audit`: each a Python function (the API: audit.run,
audit.report, ...) plus the arguments and adapter cli.py dispatches to. May import every layer.
"""
