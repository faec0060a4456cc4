"""From source items to tile values: the aggregation rules, chips, vectors, records, money, and the
memory bound per block.
"""
