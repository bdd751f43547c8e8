"""The study file: its strict schema, every default and every user-facing message about it.

`load` (`load_study`, `parse_study`: read once, then checked), `schema` (`StudyConfig` and the
smaller sections), `target`, `space`, `objective`, `workload` (one module per large section),
`base` (what every section shares), `yamlfile` (a user's YAML, safely), `validate` (the parsed
file against SGLang's flag table, the model and memory). Only `load` and `validate` import other
tuner packages: the schema is the bottom layer everything else reads.
"""
