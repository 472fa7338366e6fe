"""Request and response bodies of the job service, split by purpose:
``requests`` (what clients send), ``responses`` (what they get back)."""
