"""The lazy program's data: IR nodes and op signatures, argument templates, and the XlaTensor that holds them."""
