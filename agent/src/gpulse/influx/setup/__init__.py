"""``gpulse setup``: the database layout, for InfluxDB 2.x (``v2``) and 1.x (``v1``)."""
