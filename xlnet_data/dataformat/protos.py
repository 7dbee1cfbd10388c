"""Protobuf message classes of the formats we write and read without TensorFlow (tf.train.Example:
record_reader.py; tensorflow.Event: event_file.py), built from a FileDescriptorProto in a private pool."""



def message_class(file_proto, name: str):
    """The class of message `name` (package-qualified) of `file_proto` (a descriptor_pb2.FileDescriptorProto),
    wire-compatible with TensorFlow's own of the same field numbers."""
    from google.protobuf import descriptor_pool, message_factory  # when a message is first needed

    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    descriptor = pool.FindMessageTypeByName(name)
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)
