"""The referee: does a variant's call do the work it is timed and checked for? Its mechanisms, and
refereeing (its checks as steps of a cell)."""
