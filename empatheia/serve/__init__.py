"""Talking to the avatar: ``empatheia serve`` (a web page and an HTTP API around a model
kept in memory, :mod:`empatheia.serve.app`, which needs the ``serve`` extra) and
``empatheia chat`` (the terminal, :mod:`empatheia.serve.chat`). Both answer the turns of a
:class:`~empatheia.serve.conversation.Conversation`."""
