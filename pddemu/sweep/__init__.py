"""`pddemu sweep`: many emulations, one per point of a grid (or of a max-goodput search), each
a `pddemu emulate` of one system in its own namespaces, run one after another, several at once,
or as Ray tasks on a cluster; their summaries gathered into sweep.json and sweep.csv.

Modules: `points` (what a point is: settings, seed, system, its identity), `grid` (expanding
`--grid`), `runner` (one point as a `pddemu emulate` child process), `executors` (local and
Ray), `store` (the sweep directory: resume, sweep.json, sweep.csv), `progress`, `search`
(max-goodput bisection), `plot`, `cli`.
"""
