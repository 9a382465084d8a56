"""InfluxDB line protocol: the encoder (``encode``), its exact inverse (``parse``) and their shared limits."""
