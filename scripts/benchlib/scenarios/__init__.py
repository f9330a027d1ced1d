"""One module per scenario of the benchmark; each returns the figures it measured as a dict."""
