"""nblaunch's JupyterLab extension (server side)."""
