"""Local operations: a private simulation, a local deployment (SuperLink, SuperNodes, TLS), the LAN Fleet gate."""
