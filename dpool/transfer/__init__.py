"""Moving stored values between hosts: node to node, and to and from TCP drivers.

A stored value is a segment whose layout describes itself (``objects._segment``), so a
transfer moves the segment's bytes verbatim, in ranges over several connections of its
own at once, never on a process's control connection.

- ``_pull``: a node pulls a segment from the node that holds it into its own store (or a
  TCP driver into its own memory); the holder's side (``serve``); remote references.
- ``_push``: a TCP driver uploads a large value into its node's store; the node's side
  (``Receiver``).
- ``_ranges``: what both share -- splitting a segment into ranges, running them in
  parallel, asking on a kept connection with one retry, receive buffers, chunk writes.
- ``_conns``: authenticated transfer connections, kept per node for the next transfer.
"""
