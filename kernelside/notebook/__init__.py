"""The notebook's entry points: the IPython magics, cell programs, and export of cells as scripts."""
