"""What a release tells its readers: availability tables and heatmaps, paper-vs-release tables, the
dataset card and renderings.
"""
