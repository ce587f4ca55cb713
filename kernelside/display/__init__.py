"""What a launch shows in the kernel: rank output routed to the cell and logs, progress widgets, the chart."""
