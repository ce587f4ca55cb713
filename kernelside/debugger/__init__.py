"""JupyterLab's own debugger (the notebook's bug switch) and nblaunch's ranks.

``undebugged``: ranks started while the kernel's debugger is on start untouched by it, so a launch runs
and ends exactly as with the debugger off. The panel reaches the ranks through the kernel: ``kernel_proxy``
routes its requests (``routes``) to the kernel's debugger, every rank or one rank; ``rank_adapters`` holds
the ranks' debugger connections (``dap_connection``, ids made the panel's by ``dap_ids``); ``rank_side`` is
what a debugged rank runs, and ``cell_files`` the file name the panel knows a cell by.
"""
