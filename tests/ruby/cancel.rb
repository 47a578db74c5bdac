# Cancels the job whose jid is given as Sidekiq 7.3+ does, and prints when.
#
#   ruby cancel.rb JID
require 'sidekiq'
puts Sidekiq::Client.new.cancel!(ARGV[0])
