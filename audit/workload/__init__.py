"""What is measured: presets (grids), input scenarios and their inputs, the variants and
plug-ins, transformers' attention functions (hf) and declared kernels (adapt).
May import core only."""
