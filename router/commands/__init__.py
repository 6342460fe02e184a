"""The `cost-router` command groups: the one place that owns commands. Each module parses options,
loads the config (router.config) and hands the sections it needs to the area's library code."""
