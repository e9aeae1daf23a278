"""Models written with Flax and Equinox, built as they are: see conf/model/*.yaml and the README."""
