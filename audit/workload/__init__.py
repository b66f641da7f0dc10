"""What is measured: presets (grids), input scenarios and their inputs, the variants and
plug-ins. May import core only."""
