"""The search on a Ray cluster, with failures shared through Redis (`ray_search`; the
``kvsched[cluster]`` extra)."""
