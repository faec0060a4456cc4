"""File-system helpers every room shares: temporary names owned by a process, atomic writes and
digests.
"""
