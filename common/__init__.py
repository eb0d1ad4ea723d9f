"""What every room imports: names, labels, paths and enums; exit statuses and the CLI error path.

Standard library only.
"""
