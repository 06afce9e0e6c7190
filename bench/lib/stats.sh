# Sourced by every bench script that reports a median (directly, or through
# bench/lib/proxy.sh and bench/lib/stacks.sh): the one definition of it.
# shellcheck shell=bash

# The median of the numbers on stdin, one per line (the mean of the middle two of an even
# count); "-" when there are none, so a table row of a stack that measured nothing still
# lines up.
median() {
  sort -g | awk '{v[NR] = $1} END {
    if (NR == 0) print "-"
    else print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  }'
}
