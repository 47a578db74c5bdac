# Makes a kiq batch from Ruby with examples/ruby/kiq_batch.rb, as a Ruby app
# would, for tests/test_batch.c.
#
#   ruby batch.rb create N   N RecordJob ["rrec"] jobs, success callback
#                            BatchCallbackJob on queue "callbacks" with
#                            options {"key": "rubycb"}; prints the bid
require 'sidekiq'
require_relative '../../examples/ruby/kiq_batch'

Redis.sadd_returns_boolean = false if Redis.respond_to?(:sadd_returns_boolean=)
Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch('REDIS_URL') } }
Sidekiq.logger.level = Logger::WARN

case ARGV.shift
when 'create'
  batch = Kiq::Batch.new(description: 'from Ruby')
  batch.on(:success, 'BatchCallbackJob', queue: 'callbacks', options: { 'key' => 'rubycb' })
  begin
    batch.on(:success, 'Bad', options: [1])
    abort('a malformed callback was taken')
  rescue ArgumentError
  end
  batch.jobs do
    Integer(ARGV[0]).times { Sidekiq::Client.push('class' => 'RecordJob', 'args' => ['rrec']) }
  end
  puts batch.bid
else
  abort('usage: batch.rb create N')
end
