"""One-time adoption of a machine over SSH or AWS SSM (the only push in tether)."""
