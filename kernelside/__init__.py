"""nblaunch's kernel side: run distributed PyTorch from a notebook."""
