"""Scale-out plugins (parameter server, Ray launcher), registered through entry points."""
