"""JupyterLab's own debugger (the notebook's bug switch) and nblaunch's ranks.

``rank_start``: ranks started while the kernel's debugger is on start untouched by it, so a launch runs
and ends exactly as with the debugger off.
"""
