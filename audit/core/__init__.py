"""The ground floor: a cell (Case) and its axes, records and their schema, the names of a run
folder's files, errors, units, paths and the code's version. Imports nothing else of audit."""
