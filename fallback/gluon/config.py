"""The warp-specialised Gluon prefill's fixed sizes (plain numbers: the host code reads them
without Gluon; :mod:`parts` and :mod:`kernel` make them constexprs)."""

GROUP_ROWS = 64  # query rows per consumer warp group (a query tile: 2 or 3 groups)
BLOCK_N = 128  # kv_block: pasa-exact's block means are over exactly these keys
LOADER_REGS = 24
#: pasa-exact: with each K/V block the loader fetches the means of the MEAN_ROWS blocks
#: from the aligned one at or before it (the narrowest wgmma operand); a consumer group
#: multiplies them by Q (c = scale * Q . mean16 for those blocks) at its first block and
#: at each aligned one, and picks each block's column
MEAN_ROWS = 8
#: registers per consumer thread, with 2 or 3 groups (the loader warp's 24 and the
#: consumers' must fit the SM's 64k; the first group, the default partition, gets
#: what the others leave)
CONSUMER_REGS = {2: 240, 3: 168}
